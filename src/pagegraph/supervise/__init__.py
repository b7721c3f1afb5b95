"""Process supervision, above the checker: checks run in child processes (``isolate``: one
fresh child per list of checks, its crash or hang reported as the check's verdict) and warm
worker processes that run many isolated checks each (``worker_pool``). The jobs and the
pytest plugin start checks through this layer; the checker below never imports it."""
