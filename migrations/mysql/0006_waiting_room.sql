-- A voucher's waiting room (package room; docs/waiting-room.md).
-- NULL: the voucher has none. room_opens_at: when buyers may join;
-- room_admit_per_second: how many the room admits a second;
-- room_hold_for: seconds an admitted buyer holds a unit; room_seed: the
-- 32 random bytes that order the draw, chosen at creation, shown from
-- begin_time on (their SHA-256 from creation on).
--
-- ADD COLUMN ... NULL is instant on MariaDB 10.3+ and MySQL 8.0.12+. An
-- instance of an older version ignores the columns: it would sell a
-- room's voucher without the room, so finish the rollout before making
-- vouchers with a room.
ALTER TABLE vouchers
    ADD COLUMN room_opens_at         DATETIME(3)   NULL,
    ADD COLUMN room_admit_per_second INT           NULL,
    ADD COLUMN room_hold_for         INT           NULL,
    ADD COLUMN room_seed             VARBINARY(32) NULL;
