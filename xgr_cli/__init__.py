"""The ``xgr`` command, every subcommand in one place: ``main.py`` dispatches; ``demo``,
``export``, ``serve``, ``migrate`` and ``parity`` each turn their flags into configs and call
the libraries (``xgr_world``, ``xgr_export``, ``tf_frontend.serving``, ``bridge``). No package
imports this one (``tests/test_layering.py``)."""
