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
