// Package lock is the distributed lock of the seckill service: it keeps
// two instances of the service from running the same critical section for
// the same user or voucher at once.
package lock
