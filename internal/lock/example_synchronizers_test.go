package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"seckill/internal/lock"
)

// A semaphore of 2 permits: the third caller is turned away while two
// hold one each. Permits have a lease, so a crashed holder's come back.
func ExampleRedis_Semaphore() {
	rdb, stop := exampleRedis()
	defer stop()
	ctx := context.Background()
	calls := lock.NewRedis(rdb).Semaphore("payment-provider", 2)

	a, _ := calls.Acquire(ctx, 1, 10*time.Second)
	b, _ := calls.Acquire(ctx, 1, 10*time.Second)
	_, err := calls.Acquire(ctx, 1, 10*time.Second)
	fmt.Println(errors.Is(err, lock.ErrNotAcquired))

	a.Release(ctx) // a permit comes back
	c, err := calls.Acquire(ctx, 1, 10*time.Second)
	fmt.Println(err)
	b.Release(ctx)
	c.Release(ctx)
	// Output:
	// true
	// <nil>
}

// Readers share the lock; a writer has it alone.
func ExampleRedis_RWLock() {
	rdb, stop := exampleRedis()
	defer stop()
	ctx := context.Background()
	stock := lock.NewRedis(rdb).RWLock("stock:voucher:7")

	r1, _ := stock.ObtainRead(ctx, 5*time.Second)
	r2, err := stock.ObtainRead(ctx, 5*time.Second)
	fmt.Println("second reader:", err)
	_, err = stock.ObtainWrite(ctx, 5*time.Second)
	fmt.Println("writer among readers:", err)
	r1.Release(ctx)
	r2.Release(ctx)

	w, err := stock.ObtainWrite(ctx, 5*time.Second)
	fmt.Println("writer alone:", err)
	w.Release(ctx)
	// Output:
	// second reader: <nil>
	// writer among readers: lock: not acquired
	// writer alone: <nil>
}

// A latch of 3: the waiter goes on when three workers have counted down.
func ExampleRedis_Latch() {
	rdb, stop := exampleRedis()
	defer stop()
	ctx := context.Background()
	loaded := lock.NewRedis(rdb).Latch("sale:7:loaded")
	loaded.Set(ctx, 3, time.Minute)

	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			// ... load this instance's share of the stock ...
			loaded.CountDown(ctx)
		})
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := loaded.Wait(wctx)
	wg.Wait()
	fmt.Println("all loaded:", err)
	// Output: all loaded: <nil>
}

// Two locks, all or none, in any order: ObtainAll sorts the keys, so two
// callers listing them in different orders cannot deadlock.
func ExampleObtainAll() {
	rdb, stop := exampleRedis()
	defer stop()
	ctx := context.Background()
	locks := lock.NewRedis(rdb)

	both, err := lock.ObtainAll(ctx, locks, []string{"voucher:9", "voucher:7"}, 5*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	// Taken in order, voucher:8 is had, then voucher:9 is not: 8 is given back.
	_, err = lock.ObtainAll(ctx, locks, []string{"voucher:9", "voucher:8"}, 5*time.Second)
	fmt.Println("overlapping set:", err)
	both.Release(ctx)
	lk, err := locks.Obtain(ctx, "voucher:8", 5*time.Second)
	fmt.Println("voucher:8:", err)
	lk.Release(ctx)
	// Output:
	// overlapping set: lock: not acquired
	// voucher:8: <nil>
}

// The fair lock is a Locker whose waiters are served in order of arrival.
func ExampleRedis_Fair() {
	rdb, stop := exampleRedis()
	defer stop()
	ctx := context.Background()
	fair := lock.NewRedis(rdb).Fair()

	lk, err := fair.Obtain(ctx, "report:daily", 5*time.Second)
	fmt.Println(err)
	lk.Release(ctx)
	// Output: <nil>
}
