"""The repository's conformance tools (not shipped in the wheel): ``build_corpus.py`` writes the
corpus into ``deferq.conformance``'s package data, and ``reference_reader.py`` is a reader
written from spec/ alone. A package only so that the tests and mypy can import them.
"""
