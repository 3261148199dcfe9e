-- buckets: how many parts a voucher's stock is split into in Redis
-- (internal/stock/buckets.go); see the MySQL migration of the same number.
ALTER TABLE vouchers ADD COLUMN buckets INTEGER NOT NULL DEFAULT 1 CHECK (buckets BETWEEN 1 AND 16);
