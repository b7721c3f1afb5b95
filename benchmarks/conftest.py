"""Benchmark set-up: pagegraph's pytest plugin (the ``gpu`` marker's skip).

Running from a source tree (``PYTHONPATH=src``) the plugin's entry point is not installed, so it
is registered here; installed, the entry point has registered it already.
"""


def pytest_configure(config):
    import pagegraph.pytest_plugin as plugin

    # Installed, the entry point registered it already (under the entry point's name).
    if not config.pluginmanager.is_registered(plugin):
        config.pluginmanager.register(plugin, "pagegraph.pytest_plugin")
