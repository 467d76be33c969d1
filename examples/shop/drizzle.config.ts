import { defineConfig } from 'drizzle-kit';

export default defineConfig({
  dialect: 'postgresql',
  schema: './src/db/schema.ts',
  out: './drizzle',
  dbCredentials: { url: process.env.DATABASE_URL ?? 'postgres://localhost/shop' },
  // Trellis owns its targets: drizzle-kit push must not take them for strays and drop them.
  tablesFilter: ['!customer_revenue', '!product_sales', '!open_orders'],
});
