-- Money exactly once (issue 35).
--
-- A payment event's ID is compared byte for byte. The column had the
-- table's default collation (utf8mb4_general_ci), which folds case: a
-- second event 'evt_abc' after 'EVT_ABC' hit the primary key and was taken
-- for a retry of the first, so its payment was answered with the first
-- event's answer and never applied (another order's payment: 'paid', for
-- the wrong order, and the money kept), or a double payment was not given
-- back. VARBINARY compares bytes, with no case folding and no padding.
-- The IDs already there are distinct under the old, looser comparison, so
-- they stay distinct. The ALTER copies the table (a primary key's
-- comparison changes); old instances' webhook INSERTs wait for it, and the
-- table holds one small row per payment.
ALTER TABLE payment_events MODIFY event_id VARBINARY(64) NOT NULL;

-- The provider is asked for money once per order (order.Service.Pay,
-- Refund). charge_asked_at: when this service last asked the provider to
-- charge for the order; another click within a minute asks nothing more.
-- refund_asked_at: when it last asked for the refund; refund_sent_at: when
-- the provider took the refund, after which it is never asked again.
-- ADD COLUMN ... NULL at the end of the table is instant on MariaDB 10.3+
-- and MySQL 8.0.12+: old instances go on writing orders meanwhile, and
-- ask the provider as they always did.
ALTER TABLE voucher_orders
    ADD COLUMN charge_asked_at DATETIME(3) NULL,
    ADD COLUMN refund_asked_at DATETIME(3) NULL,
    ADD COLUMN refund_sent_at  DATETIME(3) NULL;
