"""The ``xgr`` command, every subcommand in one place: ``main.py`` dispatches; ``demo``,
``export``, ``serve``, ``migrate``, ``parity``, ``extend_vocab`` and ``stand_in`` each turn
their flags into configs and call the libraries (``xgr_world``, ``xgr_export``,
``tf_frontend.serving``, ``bridge``, ``xgr_checkpoint``). No package imports this one
(``tests/test_layering.py``)."""
