-- The embedded demo's schema: the same tables and columns as
-- migrations/mysql/0001_init.sql, in SQLite's dialect.
CREATE TABLE IF NOT EXISTS users (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    phone      TEXT     NOT NULL UNIQUE,
    created_at DATETIME NOT NULL
);

CREATE TABLE IF NOT EXISTS vouchers (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    title         TEXT     NOT NULL,
    stock         INTEGER  NOT NULL CHECK (stock >= 0),
    initial_stock INTEGER  NOT NULL,
    begin_time    DATETIME NOT NULL,
    end_time      DATETIME NOT NULL,
    created_at    DATETIME NOT NULL
);

CREATE TABLE IF NOT EXISTS voucher_orders (
    id         INTEGER  PRIMARY KEY,
    user_id    INTEGER  NOT NULL,
    voucher_id INTEGER  NOT NULL,
    status     TEXT     NOT NULL DEFAULT 'created',
    created_at DATETIME NOT NULL,
    UNIQUE (user_id, voucher_id)
);

CREATE INDEX IF NOT EXISTS idx_voucher_orders_voucher ON voucher_orders (voucher_id);
