-- Money exactly once; see the MySQL migration of the same number. SQLite's
-- payment_events.event_id (TEXT PRIMARY KEY) already compares bytes
-- (collation BINARY), so only the columns of the asks are added.
ALTER TABLE voucher_orders ADD COLUMN charge_asked_at DATETIME;
ALTER TABLE voucher_orders ADD COLUMN refund_asked_at DATETIME;
ALTER TABLE voucher_orders ADD COLUMN refund_sent_at DATETIME;
