"""Usage: the counts the decision's own backend call keeps, their roll-up to the
database, and the reports the operator tools read.

Internal: nothing here is public API (the public faces are in the docs' Python API
reference), and it may change between releases.
"""
