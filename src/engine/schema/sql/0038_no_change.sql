-- Schema version 38 changes nothing: the number was set aside for work (builds, ADR 0060;
-- Q11's shadows, ADR 0061) that turned out to need no migration. Kept so versions stay
-- contiguous.
SELECT 1;
