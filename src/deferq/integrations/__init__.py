"""Optional integrations of the queue's lifecycle hooks (spec/queue.md Q-107..Q-111).

Each lives in its own module and imports its library only when that module is imported:
``deferq.integrations.prometheus`` (``pip install 'deferq[prometheus]'``) and
``deferq.integrations.otel`` (``pip install 'deferq[otel]'``). This package imports neither.
"""
