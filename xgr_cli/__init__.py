"""The ``xgr`` command: one absl entry point per subcommand (see ``main.py``)."""
