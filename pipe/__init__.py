"""pipe's command line. Commands parse options, call the compiler or the runtime, and print."""

__version__ = "0.1.0"
