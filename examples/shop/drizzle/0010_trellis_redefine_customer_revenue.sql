-- Written by `trellis generate transform` (trellis-pg 0.2.0): Trellis statements,
-- applied in drizzle-kit migrate's transaction. Install Trellis's schema in an earlier migration.
SELECT "trellis".apply('ALTER TRANSFORM "customer_revenue" AS
FROM "order_lines"
INNER JOIN "orders" ON "order_lines"."order_id" = "orders"."id"
SELECT "orders"."customer_id" AS "customerId", sum("order_lines"."quantity" * "order_lines"."unit_price") AS "revenue", count(DISTINCT "orders"."id") AS "orders", max("orders"."placed_at") AS "lastOrderAt"
WHERE "orders"."status" = ''shipped''
GROUP BY "orders"."customer_id"');