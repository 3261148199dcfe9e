-- The order's life after the click; see the MySQL migration of the same
-- number. SQLite adds one column per statement, and its default for
-- status stays 'created' (it cannot change a column's default): every
-- insert names its status.
ALTER TABLE vouchers ADD COLUMN price INTEGER NOT NULL DEFAULT 0 CHECK (price BETWEEN 0 AND 100000000);
ALTER TABLE vouchers ADD COLUMN pay_within INTEGER NOT NULL DEFAULT 900 CHECK (pay_within BETWEEN 1 AND 86400);

ALTER TABLE voucher_orders ADD COLUMN amount INTEGER NOT NULL DEFAULT 0;
ALTER TABLE voucher_orders ADD COLUMN pay_by DATETIME;
ALTER TABLE voucher_orders ADD COLUMN paid_at DATETIME;
ALTER TABLE voucher_orders ADD COLUMN cancelled_at DATETIME;
ALTER TABLE voucher_orders ADD COLUMN refunded_at DATETIME;
ALTER TABLE voucher_orders ADD COLUMN cancel_reason TEXT;
ALTER TABLE voucher_orders ADD COLUMN bucket INTEGER NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS idx_voucher_orders_due ON voucher_orders (status, pay_by);
CREATE INDEX IF NOT EXISTS idx_voucher_orders_voucher_status ON voucher_orders (voucher_id, status);

CREATE TABLE IF NOT EXISTS payment_events (
    event_id   TEXT     PRIMARY KEY,
    order_id   INTEGER  NOT NULL,
    amount     INTEGER  NOT NULL,
    status     TEXT     NOT NULL,
    refund     BOOLEAN  NOT NULL,
    created_at DATETIME NOT NULL
);

CREATE TABLE IF NOT EXISTS stock_returns (
    order_id   INTEGER  PRIMARY KEY,
    voucher_id INTEGER  NOT NULL,
    bucket     INTEGER  NOT NULL,
    created_at DATETIME NOT NULL
);
