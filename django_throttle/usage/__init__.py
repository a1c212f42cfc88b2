"""Usage: the counts the decision's own backend call keeps, their roll-up to the
database, and the reports the operator tools read."""
