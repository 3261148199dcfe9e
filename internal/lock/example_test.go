package lock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"seckill/internal/lock"
)

// exampleRedis starts an in-memory stand-in for Redis so the examples run
// anywhere. The tests run against a real Redis; the examples only show use.
func exampleRedis() (*redis.Client, func()) {
	srv, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	return rdb, func() { rdb.Close(); srv.Close() }
}

// The plain lock: try once, do the work, release.
func ExampleRedis_Obtain() {
	rdb, stop := exampleRedis()
	defer stop()
	ctx := context.Background()
	locks := lock.NewRedis(rdb)

	lk, err := locks.Obtain(ctx, "order:voucher:7:user:42", 5*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer lk.Release(ctx)

	// A second request of the same user for the same voucher is turned away.
	_, err = locks.Obtain(ctx, "order:voucher:7:user:42", 5*time.Second)
	fmt.Println(errors.Is(err, lock.ErrNotAcquired))
	// Output: true
}

// Waiting: the second caller sleeps until the first releases the lock,
// woken by the release itself rather than by polling.
func ExampleWait() {
	rdb, stop := exampleRedis()
	defer stop()
	ctx := context.Background()
	locks := lock.NewRedis(rdb)

	first, _ := locks.Obtain(ctx, "stock:voucher:7", 10*time.Second)
	go func() {
		time.Sleep(50 * time.Millisecond) // the first holder's work
		first.Release(ctx)
	}()

	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	second, err := locks.Obtain(wctx, "stock:voucher:7", 10*time.Second, lock.Wait())
	if err != nil {
		fmt.Println(err) // ctx.Err() itself if the deadline passed first
		return
	}
	defer second.Release(ctx)
	fmt.Println("obtained after the first holder released")
	// Output: obtained after the first holder released
}

// The watchdog renews the lock while the work runs, and the work runs under
// the lock's Context: if the lock is lost, the context is cancelled and the
// transaction rolls back instead of committing unprotected.
func ExampleWithWatchdog() {
	rdb, stop := exampleRedis()
	defer stop()
	ctx := context.Background()
	locks := lock.NewRedis(rdb)

	// A 300ms ttl, renewed every 100ms, for at most a minute.
	lk, err := locks.Obtain(ctx, "order:voucher:7:user:42", 300*time.Millisecond, lock.WithWatchdog(time.Minute))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer lk.Release(ctx)

	select {
	case <-time.After(time.Second): // work that outlives the ttl three times
		fmt.Println("still held:", lk.Context().Err() == nil)
	case <-lk.Context().Done():
		// In the service: db.WithContext(lk.Context()) aborts the transaction.
		fmt.Println("lost:", context.Cause(lk.Context()))
	}
	// Output: still held: true
}

// A fencing token lets the resource itself refuse a writer whose lock has
// expired: each write carries the token, and a write with an older token
// than the last one seen is rejected, here by a guarded SQL column.
func ExampleWithFencing() {
	rdb, stop := exampleRedis()
	defer stop()
	ctx := context.Background()
	locks := lock.NewRedis(rdb)

	for range 2 {
		lk, err := locks.Obtain(ctx, "voucher:7", 10*time.Second, lock.WithFencing())
		if err != nil {
			fmt.Println(err)
			return
		}
		// UPDATE voucher SET stock = ?, fence = ? WHERE id = 7 AND fence < ?
		// with lk.Fence() as the last two arguments: RowsAffected == 0
		// means a later holder has written already, so this one must stop.
		fmt.Println("fence", lk.Fence())
		lk.Release(ctx)
	}
	// Output:
	// fence 1
	// fence 2
}

// A reentrant lock: the same owner may take it again, as a function that
// holds it calls another that takes it too. It is free once every
// acquisition has been released.
func ExampleWithOwner() {
	rdb, stop := exampleRedis()
	defer stop()
	ctx := context.Background()
	locks := lock.NewRedis(rdb)
	owner := lock.WithOwner("instance-a:request-17")

	outer, _ := locks.Obtain(ctx, "user:42", 10*time.Second, owner)
	inner, err := locks.Obtain(ctx, "user:42", 10*time.Second, owner)
	fmt.Println("entered again:", err == nil)

	_, err = locks.Obtain(ctx, "user:42", 10*time.Second, lock.WithOwner("instance-b:request-3"))
	fmt.Println("other owner:", err)

	inner.Release(ctx)
	outer.Release(ctx)
	// Output:
	// entered again: true
	// other owner: lock: not acquired
}

// The one-shot lock guards against a form submitted twice: the first
// request within the ttl passes, repeats fail at once, and nothing needs to
// be released; the key expires by itself.
func ExampleRedis_Once() {
	rdb, stop := exampleRedis()
	defer stop()
	ctx := context.Background()
	locks := lock.NewRedis(rdb)

	for range 2 {
		err := locks.Once(ctx, "voucher:create:shop-3:Spring sale", 5*time.Second)
		switch {
		case errors.Is(err, lock.ErrNotAcquired):
			fmt.Println("duplicate submission")
		case err != nil:
			fmt.Println(err) // Redis is down: not a duplicate
		default:
			fmt.Println("created")
		}
	}
	// Output:
	// created
	// duplicate submission
}

// Do is the one-shot lock that renews itself while the work runs and
// releases when it is done: a second Do for the same key meanwhile fails.
func ExampleDo() {
	rdb, stop := exampleRedis()
	defer stop()
	ctx := context.Background()
	locks := lock.NewRedis(rdb)

	err := lock.Do(ctx, locks, "report:daily", 5*time.Second, func(ctx context.Context) error {
		err := lock.Do(ctx, locks, "report:daily", 5*time.Second, func(context.Context) error { return nil })
		fmt.Println("meanwhile:", err)
		return nil
	})
	fmt.Println("done:", err)
	// Output:
	// meanwhile: lock: not acquired
	// done: <nil>
}

// RedLock holds a lock on a majority of independent servers, so it
// survives the loss of a minority of them.
func ExampleNewRedLock() {
	var clients []redis.UniversalClient
	for range 3 {
		srv, err := miniredis.Run()
		if err != nil {
			panic(err)
		}
		defer srv.Close()
		// A server gets a share of the ttl to answer, as a context
		// deadline: let the client honour it while reading too.
		rdb := redis.NewClient(&redis.Options{
			Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1,
		})
		defer rdb.Close()
		clients = append(clients, rdb)
	}
	ctx := context.Background()
	locks := lock.NewRedLock(clients)

	lk, err := locks.Obtain(ctx, "order:voucher:7:user:42", 5*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("held on a majority of", len(clients))
	lk.Release(ctx)

	_, err = locks.Obtain(ctx, "x", 5*time.Second, lock.WithFencing())
	fmt.Println(errors.Is(err, lock.ErrUnsupported))
	// Output:
	// held on a majority of 3
	// true
}

// Local locks only within one process: two instances of the service each
// have their own, and both take the "same" lock.
func ExampleNewLocal() {
	ctx := context.Background()
	instanceA, instanceB := lock.NewLocal(), lock.NewLocal()

	a, errA := instanceA.Obtain(ctx, "order:voucher:7:user:42", time.Minute)
	b, errB := instanceB.Obtain(ctx, "order:voucher:7:user:42", time.Minute)
	fmt.Println(errA, errB) // both nil: the user gets two orders
	a.Release(ctx)
	b.Release(ctx)
	// Output: <nil> <nil>
}
