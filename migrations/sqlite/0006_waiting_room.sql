-- A voucher's waiting room; see the MySQL migration of the same number.
ALTER TABLE vouchers ADD COLUMN room_opens_at DATETIME;
ALTER TABLE vouchers ADD COLUMN room_admit_per_second INTEGER;
ALTER TABLE vouchers ADD COLUMN room_hold_for INTEGER;
ALTER TABLE vouchers ADD COLUMN room_seed BLOB;
