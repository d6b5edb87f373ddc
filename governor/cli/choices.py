"""The launch command line's fixed values, spelled once: the typer options (governor/cli/) and
the lean launch and status parsers (governor/main.py) both read them. Nothing imported: the lean path reads
this before it forks the watchdog."""

BACKENDS = ("cgroupfs", "systemd", "auto")  # --backend
PSI_MODES = ("trigger", "poll")  # --psi
METRICS_ENV = "GOVERNOR_METRICS"  # --metrics' default (the governor@ unit's .env file sets it)
COMPLETE_VAR = "_GOVERNOR_COMPLETE"  # click's default for prog_name "governor" (cli/complete.py)
