-- Shared definitions for the algorithm files that follow and the driver at the end.
-- Fraction of a token forgiven when comparing, so float rounding in rates whose interval is
-- not a whole number of microseconds (7/s) never denies a request that is exactly due.
local TOLERANCE = 1e-9
local ALGORITHMS = {}
