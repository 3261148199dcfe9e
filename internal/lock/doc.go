// Package lock is the distributed lock of the seckill service. The order
// flow takes one per user and voucher, so that two requests of the same
// user, served by two instances of the service, cannot both pass the
// "one order per user" check before either has written its order.
//
// One small interface, [Locker], has six backends: [Redis] (the default),
// [RedLock] over several independent Redis servers, [MySQL] (GET_LOCK, for
// a service with a database and no Redis), [Etcd] and [ZooKeeper] (locks on
// a consensus store, which a failover does not lose, with fencing tokens
// from the store's own revisions), and [Local], which works inside one
// process only and is kept to show why that is not enough. A [Lock] is one acquisition: it is released, extended, and tells
// its holder when it is lost. On Redis there is more: a fair lock, a
// read-write lock, a semaphore, a countdown latch, and the multi-lock
// [ObtainAll] (see Synchronizers, at the end).
//
// # From SETNX to this package
//
// Each feature below exists because of a failure. They come in the order a
// developer usually meets them.
//
// A lock in memory. A sync.Mutex excludes goroutines of one process. Run two
// instances behind a load balancer and each has its own mutex: the same
// user gets two orders. The lock must live where every instance sees it,
// here Redis. [Local] keeps that mistake around for teaching.
//
// SETNX and a crash. SETNX key value takes the lock if the key is absent.
// If the holder then crashes, nobody deletes the key and the lock is held
// forever. Setting an expiry in a second command (EXPIRE) leaves the same
// hole between the two commands, so the lock is taken with one command,
// SET key value NX PX ttl: taken and bound to expire, or not taken at all.
//
// Deleting someone else's lock. Holder A's work outlasts the ttl; the key
// expires; B takes the lock; A finishes and deletes the key, B's lock. Now
// C can take it while B works. So the value is a random token only the
// holder knows (from crypto/rand: a predictable value could be forged), and
// release deletes the key only if it still holds that token. Reading,
// comparing and deleting in three commands reopens the hole (the key can
// change hands between GET and DEL), so they run as one Lua script,
// release.lua, which Redis executes atomically.
//
// Work that overruns. No ttl fits every run: too short and it expires under
// slow work, too long and a crashed holder blocks everyone. [WithWatchdog]
// renews the lock every ttl/3 while the holder lives, as Redisson's watchdog
// does, and a crashed holder stops renewing, so its lock expires soon. A
// maximum hold time keeps a stuck holder from renewing forever.
//
// Losing the lock anyway. A renewal can find the key gone: the Redis primary
// failed over to a replica that never got it, or the holder was paused past
// its ttl. Most libraries notice nothing. Here the lock's [Lock.Done]
// channel closes and its [Lock.Context] is cancelled, and the order is
// written under that context, so a lost lock rolls the transaction back
// instead of committing unprotected. The holder keeps its own deadline too,
// counted from a monotonic clock reading taken before the request that
// acquired or renewed the lock (the key may have been set at any moment of
// the round trip), minus a margin for clock drift. When the deadline passes
// without renewal, the same signals fire, even if Redis cannot be reached.
//
// Taking the lock twice in one flow. Code that holds a lock may call code
// that takes the same lock, and would wait for itself. [WithOwner] makes the
// lock reentrant. Go has no thread identity, so the caller names the owner;
// Redis stores a hash of owner -> depth, as Redisson does, and release
// frees the lock when the depth drops to zero. The owner's handles share
// one expiry, so entering again or renewing with a shorter ttl must not cut
// it: the outer handle, promised a longer ttl, would go on trusting a lock
// another owner had already taken. Entering and renewing a reentrant lock
// therefore only lengthen it, using the server's PTTL in the script.
//
// Waiting without hammering Redis. A loop of "try, sleep, try" either
// sleeps too long or floods Redis. With [Wait], the release script
// publishes on the lock's channel; one subscription per process wakes one
// waiter, who tries again. A fallback poll, never longer than the holder's
// remaining ttl, catches what announces nothing: a lock that expired, or a
// message lost while the subscription reconnected.
//
// Failover. Redis replicates asynchronously: the primary can confirm a lock
// and fail before the replica has it, and the promoted replica hands the
// lock out again. [RedLock] takes the lock on a majority (N/2+1) of N
// independent servers, counts as valid only the ttl left after the time the
// acquisition took and a drift margin, and releases on all servers.
//
// Duplicate submissions. Some guards are not locks around work but "only
// once within a few seconds": a form submitted twice, a retried RPC. The
// one-shot lock, [Redis.Once], fails at once if the key exists and is
// never renewed nor released: it expires by its ttl. [Do] is its variant
// that renews while the work runs and releases when the work is done.
//
// # How safe is it?
//
// A lease-based lock cannot by itself guarantee that two holders never act
// at once. The holder's process can stop for longer than the ttl (a GC
// pause, a swapped-out page, a stopped VM) and resume believing it holds
// the lock; a network delay can do the same to a write already in flight;
// a clock that jumps on the Redis server expires keys early, and RedLock
// assumes the clocks of its servers run at about the same rate. A failover
// can lose the key on a single Redis, and RedLock only moves that problem
// to "a majority of servers restarting without persistence".
//
// The watchdog and the lock's Context shrink these windows; they cannot
// close them, because the holder can be paused between checking its
// context and writing. Closing them takes the resource's help.
//
// Fencing tokens. With [WithFencing], each acquisition gets a number from a
// counter that never expires, strictly greater than every earlier token for
// that key. The writer sends it along, and the resource refuses a write
// carrying a smaller token than one it has already seen. In SQL a guarded
// column does it; RowsAffected == 0 means a later holder has written, and
// this one must stop:
//
//	UPDATE vouchers SET stock = ?, fence = ? WHERE id = ? AND fence < ?
//
// RedLock cannot offer tokens: independent servers share no counter. A
// token helps only where the resource checks it, so ask for one only there.
//
// The database's own guards. The seckill order does not trust the lock for
// correctness: the stock update says WHERE stock > 0 and the order table
// has a unique index on (user_id, voucher_id). The lock keeps concurrent
// requests of one user from wasting work and from racing to those guards;
// the guards keep the data right when the lock fails.
//
// Use Redis locks where a rare double execution is caught by such guards or
// is merely wasteful. A lock on a store built on consensus, [Etcd] or
// [ZooKeeper], removes one cause of a double hold: a failover does not lose
// it. What the server keeps there is a lease (etcd) or a session
// (ZooKeeper), not the lock's ttl, so the holder's deadline is the earlier
// of its ttl and the lease's or session's timeout counted from before the
// last request the server answered: a holder cut off from the server
// stops (Done) before the server can expire the lease or session and hand
// the lock on. That is all they promise. A holder paused past its deadline
// still resumes believing it holds the lock, and a write already sent
// still lands late, on these backends as on Redis. Where a double
// execution must never happen, the resource itself must refuse the stale
// writer: check a fencing token (etcd's and ZooKeeper's come from the
// store's own revisions, for free), or let the database decide: a row
// lock (SELECT ... FOR UPDATE), a unique constraint, or an update
// conditioned on a version column.
//
// Checking the promise. The tests treat a lock as Jepsen treats a
// database: many clients call Obtain and Release at once, every call's
// start, return and answer are recorded, and a checker (porcupine) looks
// for one order of the calls, each taking effect inside its own interval,
// that a plain mutex would answer the same way; then every key must be
// taken once more, so that nothing a failed call took was left behind.
// They do it on every backend, healthy and through its own failure (a
// leader killed, a master failed over, a holder's session killed). It is
// what showed that a try-once Obtain on the etcd and ZooKeeper queue
// recipes could be refused while nobody held the lock (a try queued
// behind other tries about to give up), so a try there is now the create
// of one fixed key or node, which succeeds exactly when the lock is free;
// and that a ZooKeeper node whose create's answer was lost stayed for as
// long as the session, so the client now searches for it by the token in
// its name until it has removed it.
//
// # Keys
//
// A lock named key is stored at "{lock:key}", and its fence counter at
// "{lock:key}:fence"; releases are announced on the channel
// "{lock:key}:released". The braces are a Redis Cluster hash tag: both keys
// hash to one slot, which the scripts need. Every key a script touches is
// passed in KEYS. The counter never expires, so it costs one small key per
// lock name that ever used fencing or reentrancy.
//
// # Synchronizers
//
// The Redis backend also has the synchronizers Redisson offers, built from
// the same pieces: random tokens for ownership, one Lua script per check
// and change, the shared subscription for waiting, and a [Lock] for each
// acquisition, with its Done, Context, Extend and watchdog. Their scripts
// read the time from Redis (TIME), the one clock all clients share: a
// client's clock may be off, and two clients' clocks never agree exactly.
//
// A [Semaphore] admits up to n permits at once. A counter would do, but a
// holder that crashes between taking and giving back would take its permits
// with it. So each holder has a lease, kept in a sorted set by its end
// time, and every acquisition first hands back the permits of leases that
// have ended. Its keys are "{semaphore:name}" and "{semaphore:name}:counts".
//
// An [RWLock] admits many readers or one writer. Readers that come and go
// so that one is always inside would keep a writer out forever, so a
// waiting writer leaves an intent that keeps new readers out until it has
// had its turn; the intent lives only a few polls unless renewed, so a
// writer that dies while waiting does not block readers for long. Each
// reader has its own lease, like a semaphore's holder. Its keys are
// "{rwlock:name}:writer", ":readers", ":depths" and ":intents".
//
// A [Fair] lock goes to its waiters in the order they came. After a
// release of the plain lock, whoever asks first wins, and an unlucky waiter
// can lose to newcomers again and again. The fair lock keeps a line (a
// list) and gives the lock to its first; a release wakes only that one, on
// a channel of its own. A dead waiter would block the line forever, so each
// waiter's place has a deadline, pushed on by each of its tries: a waiter
// that stops trying is dropped. Its keys are "{fairlock:key}", ":queue",
// ":alive" and ":fence".
//
// A [Latch] lets callers wait until a count, set once, has been counted
// down to zero. Counting down and opening are one script, and opening wakes
// every waiter at once: a release of a lock admits one waiter, an opened
// latch admits them all. Its key is "{latch:name}".
//
// [ObtainAll] takes several locks, all or none. Two clients that take
// overlapping sets in different orders can each hold what the other waits
// for; taking them in one order, sorted by key, makes such a cycle
// impossible. It works over any [Locker], since the locks live in
// different hash slots and no one script could take them together.
package lock
