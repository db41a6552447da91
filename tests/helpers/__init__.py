"""What the tests share that is not a fixture: builders, runners and child-process scripts.

- ``routes``: the small real route the tests run on: ``Route`` (its parts, in-process)
  and ``write_route`` / ``route_text`` (its route file); ``PATHS``, the target kinds.
- ``cli``: ``run_cli``, the console script run in this process, and ``SCRIPT``, its path.
- ``stores``: checkpoints, routes and raw SQL for the store tests; release 0.1's schema.
- ``bad_input``: the guard-payload oracle and strategies, and ``Site``, for the bad-input tests.
- ``postgres_server``: the PostgreSQL server of the store tests, and ``postgres_url``.
- ``crash_child``, ``airflow_child``: scripts the tests start as child processes, by path
  (``crash_child`` kills or stops itself for the crash and pause matrices; the crash matrix
  forks it from an interpreter that imported it once, ``run_forked``).
- ``matrix_targets``: ``Place``, where a crash- or pause-matrix case's source and SQLite,
  DuckDB or PostgreSQL target live, and the rows they hold.
- ``crash_report``, ``pause_report``: the crash and pause matrices' pytest plugins.
- ``unguarded_bulk_copy``: a deliberately unguarded path, for the conformance kit to catch.

``tests/conftest.py`` holds the fixtures; the test modules import from here
(``from helpers.routes import Route``). The tests' conftest registers this
package for pytest's assertion rewriting.
"""
