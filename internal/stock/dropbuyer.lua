-- Forget, in their home bucket, a buyer whose order async mode
-- dead-lettered when its unit came from another bucket (see
-- Store.DropBuyer): the dead letter settled the unit there, in its own
-- slot; the buyer lives here.
--
-- KEYS[1] claims, KEYS[2] buyers, KEYS[3] dropped (the home bucket's)
-- ARGV[1] user ID   ARGV[2] the dead-lettered order's ID
-- ARGV[3] the entry's mark's field (order@entry: the order ID, its stream
--         entry's ID; dropField)   ARGV[4] the dead letter's note: what a
--         retry of the entry needs to finish it (DropNotes reads it back)
--
-- Returns 1 forgotten, 2 a claim is open: the request that queued the
-- order has not yet closed it (the mark tells it to forget the buyer
-- then), 0 done before for this entry (a retry, or a second consumer
-- settling the same entry): the user may have bought again since.
--
-- Two marks, both kept after they were read:
--   user -> order ID: what KeepClaim and the sweeper read, and DropNotes
--     for an entry without a note (begun by level 7, whose script set
--     this mark alone); a replay of the dead letter, which queues the
--     order again under the same ID, removes it first (Store.Undrop);
--   order@entry -> the note: this entry's buyer was forgotten, so the
--     entry must never be written, only dead-lettered (its dead letter,
--     retried, reads the note); and this script acts once per entry. A
--     replayed order is a new entry, never marked.
if redis.call('HSETNX', KEYS[3], ARGV[3], ARGV[4]) == 0 then
  return 0
end
if redis.call('HGET', KEYS[3], ARGV[1]) == ARGV[2] then
  return 0 -- begun by an instance from before the entry's mark
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 2
end
redis.call('SREM', KEYS[2], ARGV[1])
return 1
