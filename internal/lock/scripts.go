package lock

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The scripts run with EVALSHA, falling back to EVAL when Redis has not
// seen them yet (redis.Script.Run). Their return codes are named in each
// .lua file; the constants below must match.
var (
	//go:embed obtain.lua
	obtainLua    string
	obtainScript = redis.NewScript(obtainLua)

	//go:embed extend.lua
	extendLua    string
	extendScript = redis.NewScript(extendLua)

	//go:embed release.lua
	releaseLua    string
	releaseScript = redis.NewScript(releaseLua)

	//go:embed semaphore_acquire.lua
	semAcquireLua    string
	semAcquireScript = redis.NewScript(semAcquireLua)

	//go:embed semaphore_extend.lua
	semExtendLua    string
	semExtendScript = redis.NewScript(semExtendLua)

	//go:embed semaphore_release.lua
	semReleaseLua    string
	semReleaseScript = redis.NewScript(semReleaseLua)

	//go:embed rwlock_obtain.lua
	rwObtainLua    string
	rwObtainScript = redis.NewScript(rwObtainLua)

	//go:embed rwlock_extend.lua
	rwExtendLua    string
	rwExtendScript = redis.NewScript(rwExtendLua)

	//go:embed rwlock_release.lua
	rwReleaseLua    string
	rwReleaseScript = redis.NewScript(rwReleaseLua)

	//go:embed fair_line.lua
	fairLineLua string

	//go:embed fair_obtain.lua
	fairObtainLua    string
	fairObtainScript = redis.NewScript(fairLineLua + fairObtainLua)

	//go:embed fair_release.lua
	fairReleaseLua    string
	fairReleaseScript = redis.NewScript(fairLineLua + fairReleaseLua)

	//go:embed latch_count_down.lua
	latchCountDownLua    string
	latchCountDownScript = redis.NewScript(latchCountDownLua)
)

// obtain.lua
const (
	obtainTaken     = 0
	obtainAcquired  = 1
	obtainReentered = 2
)

// extend.lua
const (
	extendNotHeld  = 0
	extendExtended = 1
)

// release.lua
const (
	releaseNotHeld  = 0
	releaseReleased = 1
	releaseEntered  = 2
)

// The scripts of the synchronizers (semaphore_*.lua, rwlock_*.lua, ...)
// answer with the codes of obtain.lua (TAKEN, ACQUIRED, REENTERED),
// extend.lua (NOT_HELD, EXTENDED) and release.lua (NOT_HELD, RELEASED,
// ENTERED).

// keys names what Redis stores for the lock called key. The braces make a
// Redis Cluster hash tag: the lock and its fence counter hash to the same
// slot, which the obtain script needs since it touches both. The tag starts
// with "lock:" so it is never empty, which would void it.
type keys struct {
	lock     string // the lock itself
	fence    string // its fencing-token counter
	released string // the pub/sub channel its releases are announced on
}

func keysFor(key string) keys {
	base := "{lock:" + key + "}"
	return keys{lock: base, fence: base + ":fence", released: base + ":released"}
}
