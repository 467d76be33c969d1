-- Placeholder so migrations stay numbered without gaps on branch hb-capture-edges (its own
-- migration is 0028); the lead drops this file at merge, where 0027 is another branch's.
SELECT 1;
