"""Test-suite set-up: pagegraph's pytest plugin, and hypothesis profiles.

Running from a source tree (``PYTHONPATH=src``) the plugin's entry point is not installed, so it
is registered here; installed, the entry point has registered it already.
"""

import os

from hypothesis import settings

settings.register_profile("ci", deadline=None, derandomize=True)
settings.register_profile("gpu", deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    if not config.pluginmanager.has_plugin("pagegraph"):
        import pagegraph.pytest_plugin as plugin

        config.pluginmanager.register(plugin, "pagegraph")
