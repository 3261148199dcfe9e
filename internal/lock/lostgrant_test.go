package lock

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv/faultproxy"
)

// A waiter whose winning try's answer is lost gives up without knowing it
// holds the lock. Leaving the line must free it, or everyone behind would
// wait out its ttl (30 s here). The proxy drops the answer of the try that
// follows the holder's release: the one that takes the lock.
func TestFairLostGrantFreedOnLeave(t *testing.T) {
	r, rdb := syncRedis(t)
	key := fairKey(t, rdb)
	proxy := faultproxy.Start(t, rdb.Options().Addr)
	far := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1})
	t.Cleanup(func() { far.Close() })
	fr := NewRedis(far)
	fr.maxPoll = 30 * time.Second

	holder := mustObtain(t, r.Fair(), key, 10*time.Second)
	gaveUp := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := fr.Fair().Obtain(ctx, key, 30*time.Second, Wait())
		gaveUp <- err
	}()
	waitInLine(t, rdb, key, 1)
	lockKey := []byte(fairKeysFor(key).lock)
	dropped := proxy.DropReplyAfter(func(req []byte) bool {
		return bytes.Contains(bytes.ToLower(req), []byte("evalsha")) && bytes.Contains(req, lockKey)
	})
	mustRelease(t, holder)
	select {
	case <-dropped:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter never tried again after the release")
	}
	if err := <-gaveUp; err == nil {
		t.Fatal("the waiter got the lock although its answer was dropped")
	}
	lk, err := r.Fair().Obtain(context.Background(), key, time.Second)
	if err != nil {
		t.Fatalf("after the waiter gave up: %v; its lost grant still holds the lock", err)
	}
	mustRelease(t, lk)
}

// The same for a writer of a read-write lock: the try that follows the
// last reader's release takes the lock, its answer is lost, and the writer
// gives up. Withdrawing its intent must free the write lock too.
func TestRWLostWriteGrantFreedOnGivingUp(t *testing.T) {
	r, rdb := syncRedis(t)
	name := rwName(t, r)
	proxy := faultproxy.Start(t, rdb.Options().Addr)
	far := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1})
	t.Cleanup(func() { far.Close() })
	fr := NewRedis(far)
	fr.maxPoll = 30 * time.Second

	reader, err := r.RWLock(name).ObtainRead(context.Background(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	gaveUp := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := fr.RWLock(name).ObtainWrite(ctx, 30*time.Second, Wait())
		gaveUp <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for rdb.ZCard(context.Background(), rwKeysFor(name).intents).Val() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the writer never waited")
		}
		time.Sleep(5 * time.Millisecond)
	}
	writerKey := []byte(rwKeysFor(name).writer)
	dropped := proxy.DropReplyAfter(func(req []byte) bool {
		return bytes.Contains(bytes.ToLower(req), []byte("evalsha")) && bytes.Contains(req, writerKey)
	})
	mustRelease(t, reader)
	select {
	case <-dropped:
	case <-time.After(5 * time.Second):
		t.Fatal("the writer never tried again after the release")
	}
	if err := <-gaveUp; err == nil {
		t.Fatal("the writer got the lock although its answer was dropped")
	}
	lk, err := r.RWLock(name).ObtainRead(context.Background(), time.Second)
	if err != nil {
		t.Fatalf("a reader after the writer gave up: %v; its lost grant still holds the lock", err)
	}
	mustRelease(t, lk)
}
