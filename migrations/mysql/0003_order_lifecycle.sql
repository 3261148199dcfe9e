-- The order's life after the click (docs/order-lifecycle.md): a voucher
-- has a price and a time to pay; an order is unpaid until it is paid, or
-- cancelled (by its buyer, or by its deadline), and a paid one may be
-- refunded. A cancelled or refunded order's unit goes back on sale.
--
-- price: cents. pay_within: seconds a buyer has to pay, from the order.
ALTER TABLE vouchers
    ADD COLUMN price      BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN pay_within INT    NOT NULL DEFAULT 900,
    ADD CONSTRAINT chk_vouchers_price CHECK (price BETWEEN 0 AND 100000000),
    ADD CONSTRAINT chk_vouchers_pay_within CHECK (pay_within BETWEEN 1 AND 86400);

-- amount: the voucher's price when the order was taken. pay_by: created_at
-- + pay_within. bucket: the Redis bucket the unit came from, where it goes
-- back (internal/stock/buckets.go). The index on (status, pay_by) is how
-- the deadline is kept: every instance looks up the unpaid orders whose
-- pay_by has passed, in an index range, with no timer in any process.
--
-- (key ..._voucher_status lets the live page count a voucher's orders by
-- status from the index alone.)
ALTER TABLE voucher_orders
    ALTER COLUMN status SET DEFAULT 'unpaid',
    ADD COLUMN amount        BIGINT      NOT NULL DEFAULT 0,
    ADD COLUMN pay_by        DATETIME(3) NULL,
    ADD COLUMN paid_at       DATETIME(3) NULL,
    ADD COLUMN cancelled_at  DATETIME(3) NULL,
    ADD COLUMN refunded_at   DATETIME(3) NULL,
    ADD COLUMN cancel_reason VARCHAR(16) NULL,
    ADD COLUMN bucket        INT         NOT NULL DEFAULT 0,
    ADD KEY idx_voucher_orders_due (status, pay_by),
    ADD KEY idx_voucher_orders_voucher_status (voucher_id, status);

-- The orders before the lifecycle ('created') become unpaid, due
-- created_at + 900 s: every voucher made before has the defaults just
-- added, price 0 and pay_within 900, so no JOIN is needed (one would
-- share-lock the vouchers' rows, and deadlock with an old instance's
-- order waiting for one). Instances of the old version may still write
-- 'created' during the rollout: the new ones read it as 'unpaid', and
-- their expirer dates such rows (order.Service.Expire). Run again after a
-- start cut short, it finds nothing left to change.
UPDATE voucher_orders SET status = 'unpaid', amount = 0, pay_by = created_at + INTERVAL 900 SECOND
 WHERE status = 'created';

-- The payment events applied, each once: the webhook inserts its event_id
-- first, in the transaction that changes the order, with the answer it
-- gave, so that a retried event gets the same answer and changes nothing.
CREATE TABLE IF NOT EXISTS payment_events (
    event_id   VARCHAR(64) NOT NULL,
    order_id   BIGINT      NOT NULL,
    amount     BIGINT      NOT NULL,
    status     VARCHAR(16) NOT NULL,
    refund     BOOLEAN     NOT NULL,
    created_at DATETIME(3) NOT NULL,
    PRIMARY KEY (event_id),
    KEY idx_payment_events_order (order_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- Units MySQL took back (a cancel, a refund) that Redis has not yet: a row
-- is written in the transaction that changes the order, and deleted once
-- Redis has the unit (stock.Store.Return, which adds it at most once).
CREATE TABLE IF NOT EXISTS stock_returns (
    order_id   BIGINT      NOT NULL,
    voucher_id BIGINT      NOT NULL,
    bucket     INT         NOT NULL,
    created_at DATETIME(3) NOT NULL,
    PRIMARY KEY (order_id),
    KEY idx_stock_returns_voucher (voucher_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
