"""Benchmark set-up: pagegraph's pytest plugin (the ``gpu`` marker's skip).

Running from a source tree (``PYTHONPATH=src``) the plugin's entry point is not installed, so it
is registered here; installed, the entry point has registered it already.
"""


def pytest_configure(config):
    if not config.pluginmanager.has_plugin("pagegraph"):
        import pagegraph.pytest_plugin as plugin

        config.pluginmanager.register(plugin, "pagegraph")
