"""The kinds of plan steps, a module each: `source` (ingest steps), `write` (table steps), and
what every step of a run shares (`context`) and how failures read (`errors`). The executor
(runtime/executor.py) orders them, runs them on its threads and reports them."""
