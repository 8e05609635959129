"""The pure core: limits, value types, errors, the record codec, the recovery table, the replay
fast path and the model. No I/O: nothing here imports the engine, the operating system or a clock.
"""
