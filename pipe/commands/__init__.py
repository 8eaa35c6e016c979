"""The `pipe` command's commands, a module per kind (pipe/cli.py gathers them into its group):
`project` (init, compile, ls, docs, discover, doctor), `run` (run, build, seed, test, retry),
`server` (server, pack-env), `tables` (show, timeline and the table services), `diff`; and what
they share: `common` (the context, options, compiling, exit codes) and `sessions` (the Spark a
command runs on)."""
