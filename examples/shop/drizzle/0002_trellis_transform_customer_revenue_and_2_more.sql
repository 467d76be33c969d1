-- Written by `trellis generate transform` (trellis-pg 0.1.0): Trellis statements,
-- applied in drizzle-kit migrate's transaction. Install Trellis's schema in an earlier migration.
SELECT "trellis".apply('TRANSFORM "customer_revenue"
FROM "order_lines"
INNER JOIN "orders" ON "order_lines"."order_id" = "orders"."id"
SELECT "orders"."customer_id" AS "customerId", sum("order_lines"."quantity" * "order_lines"."unit_price") AS "revenue", count(DISTINCT "orders"."id") AS "orders"
WHERE "orders"."status" in (''paid'', ''shipped'')
GROUP BY "orders"."customer_id"');--> statement-breakpoint
SELECT "trellis".apply('TRANSFORM "open_orders"
FROM "orders"
SELECT "orders"."id" AS "id", "orders"."customer_id" AS "customerId", "orders"."placed_at" AS "placedAt"
WHERE "orders"."status" = ''open''');--> statement-breakpoint
SELECT "trellis".apply('TRANSFORM "product_sales"
FROM "order_lines"
INNER JOIN "products" ON "order_lines"."product_id" = "products"."id"
INNER JOIN "orders" ON "order_lines"."order_id" = "orders"."id"
SELECT "products"."id" AS "productId", "products"."name" AS "name", "products"."category" AS "category", sum("order_lines"."quantity") AS "unitsSold", sum("order_lines"."quantity" * "order_lines"."unit_price") AS "revenue"
WHERE "orders"."status" in (''paid'', ''shipped'')
GROUP BY "products"."id", "products"."name", "products"."category"
HAVING sum("order_lines"."quantity") >= 3');