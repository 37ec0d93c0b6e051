"""The ``recovery`` subcommands, one module per command group: ``listing`` (ls, with
``tierrows`` for its local-tier rows), ``reading`` (verify, inspect, audit), ``drill``,
``serve`` (export, predict), ``importing`` (import), ``reporting`` (report), ``plan``,
``sync`` and ``keys`` (keygen). :mod:`recovery.cli.main` imports only the one that runs.
"""
