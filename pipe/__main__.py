from pipe.cli import entry

entry()
