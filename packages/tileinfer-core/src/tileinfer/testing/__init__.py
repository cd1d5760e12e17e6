"""The conformance suite that every backend, ours or a third party's, runs against itself.

    pytest --pyargs tileinfer.testing.conformance --tileinfer-backend NAME

compares each op of backend NAME with the ref backend on random inputs of odd and typical shapes.
Without ``--tileinfer-backend`` it runs for every available backend. A plugin that is not
installed as an entry point can be registered first in a ``conftest.py`` with
``tileinfer.backends.registry().register(plugin)``.
"""
