-- buckets: how many parts a voucher's stock is split into in Redis, so
-- that a hot voucher's scripts spread over the masters of a Redis Cluster
-- (internal/stock/buckets.go). Every instance reads it from here: all must
-- agree on where a voucher's keys are. 1 for vouchers made before.
ALTER TABLE vouchers
    ADD COLUMN buckets INT NOT NULL DEFAULT 1,
    ADD CONSTRAINT chk_vouchers_buckets CHECK (buckets BETWEEN 1 AND 16);
