-- A voucher's orders counted in its own row; see the MySQL migration of
-- the same number. SQLite adds one column per statement, and the embedded
-- demo has no old instances to count beside it.
ALTER TABLE vouchers ADD COLUMN sold INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vouchers ADD COLUMN paid INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vouchers ADD COLUMN cancelled INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vouchers ADD COLUMN refunded INTEGER NOT NULL DEFAULT 0;
UPDATE vouchers SET
    sold      = (SELECT COUNT(*) FROM voucher_orders o WHERE o.voucher_id = vouchers.id),
    paid      = (SELECT COUNT(*) FROM voucher_orders o WHERE o.voucher_id = vouchers.id AND o.status IN ('paid', 'refunded')),
    cancelled = (SELECT COUNT(*) FROM voucher_orders o WHERE o.voucher_id = vouchers.id AND o.status = 'cancelled'),
    refunded  = (SELECT COUNT(*) FROM voucher_orders o WHERE o.voucher_id = vouchers.id AND o.status = 'refunded');
