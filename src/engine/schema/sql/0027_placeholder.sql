-- Placeholder for a migration number another branch holds (the lead drops it at merge).
SELECT 1;
