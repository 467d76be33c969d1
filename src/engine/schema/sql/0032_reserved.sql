-- Reserved for another branch's migration 0032 (issue #25 work was given 0035): the lead
-- replaces this file with that migration when merging.
SELECT 1;
