-- Placeholder for migration 0032, given to another branch: migrations are numbered 1, 2,
-- 3… with no gap, and this branch's 0033 needs one before it to build and test. The lead
-- replaces this file with the other branch's 0032 when merging.
SELECT 1;
