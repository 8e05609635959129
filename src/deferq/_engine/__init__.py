"""The storage engine behind one seam (``env.Env``): the tasks WAL, the dead-task store, its index
and compaction, task ids, verification. Speaks to the world only through the seam.
"""
