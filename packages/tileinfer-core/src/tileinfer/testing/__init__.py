"""The conformance suite that every backend, ours or a third party's, runs against itself.

    pytest --pyargs tileinfer.testing.conformance --tileinfer-backend NAME

compares each op of the contract of backend NAME with the ref backend on random inputs of odd and
typical shapes (the optional ``attention_with_inputs`` only where the backend implements it).
Without ``--tileinfer-backend`` it runs for every available backend. A plugin that is not
installed as an entry point can be registered first in a ``conftest.py`` with
``tileinfer.backend.registry().register(plugin)``. ``plugin`` is the pytest plugin (entry point
``pytest11``) that adds the option.
"""
