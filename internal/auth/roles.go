package auth

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"seckill/internal/apperr"
)

// Admin rights that end. Login writes the role into the token, from
// ADMIN_PHONES as it was then; the token lasts TOKEN_TTL. Trusted as it
// stands, a token issued while a phone was an admin's would stay an
// admin's after the phone left the list, until it expired. So the admin
// routes take the role from the token only as a claim, and check it
// against the phone of the token's user and ADMIN_PHONES as this
// instance has it now: an instance restarted without a phone refuses that
// phone's admin tokens at once. The phone is read from MySQL and
// remembered for adminFor (it never changes through the API; the minute
// bounds how long an edit of the users table goes unnoticed). Only tokens
// that claim the admin role are checked, and only on the routes that
// honour it: the buy path never pays for this.

// adminFor is how long an instance remembers whether a user is an admin.
const adminFor = time.Minute

// maxAdminEntries bounds what the instance remembers: only tokens that
// claim the admin role, all signed by this service, ever reach it, so it
// stays small; past the bound it starts again empty.
const maxAdminEntries = 1024

// adminCache remembers, per user, whether their phone is in ADMIN_PHONES.
type adminCache struct {
	mu sync.Mutex
	m  map[int64]adminEntry
}

type adminEntry struct {
	admin bool
	until time.Time
}

// isAdmin reports whether user's phone is in ADMIN_PHONES now.
func (s *Service) isAdmin(ctx context.Context, user int64) (bool, error) {
	if len(s.admins) == 0 {
		return false, nil
	}
	now := s.tokens.now()
	s.adminSeen.mu.Lock()
	e, ok := s.adminSeen.m[user]
	s.adminSeen.mu.Unlock()
	if ok && now.Before(e.until) {
		return e.admin, nil
	}
	var u User
	err := s.db.WithContext(ctx).Select("phone").Where("id = ?", user).Take(&u).Error
	if err != nil && !errors.Is(err, gorm.ErrRecordNotFound) {
		return false, apperr.Down(fmt.Errorf("find phone of user %d: %w", user, err))
	}
	e = adminEntry{admin: u.Phone != "" && s.admins[u.Phone], until: now.Add(adminFor)}
	s.adminSeen.mu.Lock()
	if s.adminSeen.m == nil || len(s.adminSeen.m) >= maxAdminEntries {
		s.adminSeen.m = map[int64]adminEntry{}
	}
	s.adminSeen.m[user] = e
	s.adminSeen.mu.Unlock()
	return e.admin, nil
}

// currentRole corrects the identity Authenticate recorded: a token that
// claims the admin role for a user whose phone is not in ADMIN_PHONES
// (any more) is a plain user's.
func (s *Service) currentRole(c *gin.Context) (Identity, error) {
	id := From(c)
	if id.Role != RoleAdmin {
		return id, nil
	}
	admin, err := s.isAdmin(c.Request.Context(), id.UserID)
	if err != nil {
		return Identity{}, err
	}
	if !admin {
		id.Role = RoleUser
		c.Set(identityKey, id)
	}
	return id, nil
}

// RequireAdmin is middleware, after Authenticate, that lets only admins
// on: tokens with the admin role whose user's phone is in ADMIN_PHONES
// now.
func (s *Service) RequireAdmin(fail func(*gin.Context, error)) gin.HandlerFunc {
	return func(c *gin.Context) {
		id, err := s.currentRole(c)
		if err != nil {
			fail(c, err)
			return
		}
		if id.Role != RoleAdmin {
			fail(c, ErrForbidden)
			return
		}
		c.Next()
	}
}

// CurrentRole is middleware, after Authenticate, for the routes open to
// every user where an admin may do more (see an order of anyone's,
// refund it): a token whose user is no longer an admin goes on as a plain
// user's.
func (s *Service) CurrentRole(fail func(*gin.Context, error)) gin.HandlerFunc {
	return func(c *gin.Context) {
		if _, err := s.currentRole(c); err != nil {
			fail(c, err)
			return
		}
		c.Next()
	}
}
