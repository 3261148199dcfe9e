package order

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A flood that finds the ID sequence (or a voucher's keys) missing makes
// one attempt per instance, not one per request: the rest wait for it.
// And the first caller giving up does not end the attempt the others wait
// on.
func TestAloneOneAttemptForManyCallers(t *testing.T) {
	s := &Service{common: common{cfg: Config{WriteTimeout: 5 * time.Second}}}
	var calls atomic.Int32
	release := make(chan struct{})
	attempt := func(ctx context.Context) error {
		calls.Add(1)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	// The first caller starts the attempt and leaves early.
	early, leave := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() { left <- s.alone(early, "seed", attempt) }()
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}

	const n = 500
	var wg sync.WaitGroup
	var started atomic.Int32
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			started.Add(1)
			errs <- s.alone(context.Background(), "seed", attempt)
		})
	}
	leave()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller that left: %v, want its context's error", err)
	}
	for started.Load() < n {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // the others are waiting now
	if got := calls.Load(); got != 1 {
		t.Fatalf("%d attempts for %d callers at once, want 1", got, n+1)
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a caller that waited: %v, want the attempt's result", err)
		}
	}
}

// The attempt's error reaches every caller, a panic in it becomes an error
// instead of ending the process, and after Close no attempt starts and
// none is left running.
func TestAloneErrorsPanicsAndClose(t *testing.T) {
	s := NewService(nil, nil, nil, nil, nil, nil, time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)), Config{WriteTimeout: 5 * time.Second})
	boom := errors.New("boom")
	if err := s.alone(context.Background(), "k", func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("an attempt's error: %v, want boom", err)
	}
	err := s.alone(context.Background(), "k", func(context.Context) error { panic("malformed key") })
	if err == nil || !strings.Contains(err.Error(), "malformed key") {
		t.Fatalf("a panicking attempt: %v, want an error naming the panic", err)
	}

	started, ended := make(chan struct{}), make(chan error, 1)
	go s.alone(context.Background(), "slow", func(ctx context.Context) error {
		close(started)
		<-ctx.Done() // Close must end it
		ended <- ctx.Err()
		return ctx.Err()
	})
	<-started
	s.Close()
	select {
	case <-ended:
	default:
		t.Fatal("Close returned while an attempt still ran")
	}
	if err := s.alone(context.Background(), "k", func(context.Context) error { return nil }); !errors.Is(err, errClosed) {
		t.Fatalf("an attempt after Close: %v, want errClosed", err)
	}
}
