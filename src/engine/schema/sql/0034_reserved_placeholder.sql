-- Reserved: another branch's migration takes this number (branch hG-viewsql was given 0036).
-- This placeholder keeps the numbering contiguous on this branch; drop it at the merge.
SELECT 1;
