package testenv

import (
	"context"
	"testing"

	"github.com/chromedp/chromedp"
)

// Browser starts a headless Chromium (Debian's chromium package) for the
// test, with a profile of its own, and returns a chromedp context on one
// tab; both end with the test. It is an integration test: skipped unless
// Enabled, and without chromium skipped, or failed when
// SECKILL_REQUIRE_INTEGRATION=1.
func Browser(t testing.TB) context.Context {
	t.Helper()
	path := lookPath(t, "chromium")
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(tempDir(t, "chromium")),
		// As root in a sandbox of its own, Chromium's sandbox cannot
		// start; the page is the test's own.
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		// Nothing but the test's server: this machine's network refuses
		// Chromium's calls home, many at a time.
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.WindowSize(1280, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		cancel()
		cancelAlloc()
		t.Fatalf("start chromium: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	return ctx
}
