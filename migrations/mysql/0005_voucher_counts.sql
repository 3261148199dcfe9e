-- A voucher's orders counted in its own row (issue 35), so that the live
-- page reads a sale's figures from one row however many orders it has.
-- Before, each read counted them (a SUM over the voucher's voucher_orders
-- rows): on a sale of 300,000 orders, 50 to 100 ms of MariaDB's time per
-- read, once a second per watched voucher and instance (and more often
-- when streams came and went: see internal/live/feed.go).
--
-- Each column counts the orders that ever entered a state: sold (written),
-- paid, cancelled, refunded. The statement that moves an order into the
-- state adds one, in the same transaction; where the move takes or gives
-- back a unit (a sale, a cancel, a refund), in the very UPDATE that moves
-- the stock, which already locks the voucher's row: counting there costs
-- no statement and no lock more. A payment adds an UPDATE of the row
-- after the order's own (package order). From them: unpaid = sold - paid
-- - cancelled; paid now = paid - refunded; holding a unit = sold -
-- cancelled - refunded, which with the stock makes the initial stock.
--
-- ADD COLUMN ... DEFAULT at the end of the table is instant on MariaDB
-- 10.3+ and MySQL 8.0.12+: no copy, and old instances go on selling
-- meanwhile (they read vouchers by column name or into a struct that
-- ignores the new columns, and create vouchers with the default, 0).
ALTER TABLE vouchers
    ADD COLUMN sold      INT NOT NULL DEFAULT 0,
    ADD COLUMN paid      INT NOT NULL DEFAULT 0,
    ADD COLUMN cancelled INT NOT NULL DEFAULT 0,
    ADD COLUMN refunded  INT NOT NULL DEFAULT 0;

-- The orders already there, counted. READ COMMITTED for this statement
-- alone (SET TRANSACTION, without SESSION, sets the next transaction's):
-- under it a single-table UPDATE reads its subqueries as a consistent
-- read and locks no order; under REPEATABLE READ each subquery
-- share-locks every order it counts, and an old instance's cancel or sale
-- of those orders would wait for the whole statement (a multi-table
-- UPDATE ... JOIN share-locks them at any level, hence the subqueries).
-- The vouchers' rows are locked while it runs: a moment per 100,000
-- orders, through the (voucher_id, status) index. Run again after a
-- start cut short, it counts the same.
--
-- Instances of the version before still running during the rollout sell,
-- pay and cancel without counting: a voucher they sell from meanwhile
-- shows fewer orders on its live page than it has, and its invariant red
-- (its stock fell, its count did not). Nothing else reads the counters,
-- and no unit is sold or given back by them. Once the last old instance
-- has stopped, the same two statements with "WHERE id = <voucher>" at the
-- end count that voucher again; while new instances sell it too: the
-- UPDATE locks the voucher's row first, as every write that counts does
-- before its COMMIT, and its consistent read then sees every order
-- counted so far.
SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
UPDATE vouchers v SET
    sold      = (SELECT COUNT(*) FROM voucher_orders o WHERE o.voucher_id = v.id),
    paid      = (SELECT COUNT(*) FROM voucher_orders o WHERE o.voucher_id = v.id AND o.status IN ('paid', 'refunded')),
    cancelled = (SELECT COUNT(*) FROM voucher_orders o WHERE o.voucher_id = v.id AND o.status = 'cancelled'),
    refunded  = (SELECT COUNT(*) FROM voucher_orders o WHERE o.voucher_id = v.id AND o.status = 'refunded');
