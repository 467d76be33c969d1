-- Schema version 32 changes nothing: the number was set aside for a change of the build
-- (ADR 0050) that turned out to need no migration. Kept so versions stay contiguous.
SELECT 1;
