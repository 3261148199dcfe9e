package auth

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"regexp"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/apperr"
)

// User is a row of users.
type User struct {
	ID        int64
	Phone     string
	CreatedAt time.Time
}

// TableName is the contract's table name.
func (User) TableName() string { return "users" }

var (
	phoneRE = regexp.MustCompile(`^1[0-9]{10}$`)
	codeRE  = regexp.MustCompile(`^[0-9]{6}$`)

	errBadPhone = apperr.Invalid("phone must be 11 digits starting with 1")
	errBadCode  = apperr.Invalid("code must be 6 digits")
)

// Service logs users in and out, and knows who is an admin now.
type Service struct {
	db     *gorm.DB
	rdb    redis.UniversalClient
	tokens *Tokens
	admins map[string]bool // ADMIN_PHONES
	// adminSeen remembers whose phone is in admins, for the admin
	// routes (roles.go).
	adminSeen adminCache
	sender    Sender
	limits    Limits
	// afterCheck, in tests, runs once the phone's script has compared a
	// code: a client hanging up at that moment.
	afterCheck func()
}

// NewService returns a Service; admins are the phones that log in as
// admin, sender delivers the codes, limits bound codes and guesses.
func NewService(db *gorm.DB, rdb redis.UniversalClient, tokens *Tokens, admins []string, sender Sender, limits Limits) *Service {
	set := make(map[string]bool, len(admins))
	for _, p := range admins {
		set[p] = true
	}
	return &Service{db: db, rdb: rdb, tokens: tokens, admins: set, sender: sender, limits: limits}
}

// SendCode makes a new code for phone, sends it and returns it (the
// handler shows it only in dev mode). The phone's earlier codes stay
// valid until they expire. addr is the client's address, for the
// per-address limit and the phone's trust in it. Over a limit it answers
// a busy error with a Retry-After hint (apperr.RetryAfterOf).
func (s *Service) SendCode(ctx context.Context, phone, addr string) (string, error) {
	if !phoneRE.MatchString(phone) {
		return "", errBadPhone
	}
	// The address first: a client flooding many phones is stopped before
	// it touches any phone's keys.
	if err := s.admitAddr(ctx, addr); err != nil {
		return "", err
	}
	n, err := rand.Int(rand.Reader, big.NewInt(1_000_000))
	if err != nil {
		return "", fmt.Errorf("make login code: %w", err)
	}
	code := fmt.Sprintf("%06d", n.Int64())
	if err := s.storeCode(ctx, phone, addr, code); err != nil {
		return "", err
	}
	// A send that fails still counted towards the phone's limits: a
	// gateway that timed out may have delivered it, and a failing gateway
	// must not become a way around the limits.
	if err := s.sender.Send(ctx, phone, code); err != nil {
		return "", fmt.Errorf("send login code: %w", err)
	}
	return code, nil
}

// Login checks phone's code, creates the user on first login, and returns
// a token with the user. addr is the client's address: wrong guesses are
// counted per phone and address, per address, and per phone from
// addresses it never logged in from (see Limits). Over a limit it answers
// a busy error with a Retry-After hint.
func (s *Service) Login(ctx context.Context, phone, code, addr string) (string, User, error) {
	if !phoneRE.MatchString(phone) {
		return "", User{}, errBadPhone
	}
	if !codeRE.MatchString(code) {
		return "", User{}, errBadCode
	}
	if err := s.checkCode(ctx, phone, code, addr); err != nil {
		return "", User{}, err
	}
	u, err := s.user(ctx, phone)
	if err != nil {
		return "", User{}, err
	}
	role := RoleUser
	if s.admins[phone] {
		role = RoleAdmin
	}
	token, err := s.tokens.Issue(ctx, Identity{UserID: u.ID, Role: role})
	return token, u, err
}

// Logout ends every session of user: their tokens issued until now are
// void on every instance within Refresh (sessions.go). Logging in again
// works at once.
func (s *Service) Logout(ctx context.Context, user int64) error {
	return s.tokens.EndSessions(ctx, user)
}

// TokenFor signs in phone's user (creating it) without a login code, as a
// plain user: for the live page's simulated crowd (package live), which
// only an admin of a server started with LIVE_CROWD=true may start. Never
// reachable by a client otherwise.
func (s *Service) TokenFor(ctx context.Context, phone string) (string, error) {
	if !phoneRE.MatchString(phone) {
		return "", errBadPhone
	}
	u, err := s.user(ctx, phone)
	if err != nil {
		return "", err
	}
	return s.tokens.Issue(ctx, Identity{UserID: u.ID, Role: RoleUser})
}

// user finds phone's user or creates it. Two first logins racing both try
// to insert; the unique index on phone lets one win and the other reads it.
func (s *Service) user(ctx context.Context, phone string) (User, error) {
	db := s.db.WithContext(ctx)
	for range 2 {
		var u User
		err := db.Where("phone = ?", phone).Take(&u).Error
		if err == nil {
			return u, nil
		}
		if !errors.Is(err, gorm.ErrRecordNotFound) {
			return User{}, apperr.Down(fmt.Errorf("find user: %w", err))
		}
		u = User{Phone: phone, CreatedAt: time.Now().UTC().Truncate(time.Second)}
		err = db.Create(&u).Error
		if err == nil {
			return u, nil
		}
		if !errors.Is(err, gorm.ErrDuplicatedKey) {
			return User{}, apperr.Down(fmt.Errorf("create user: %w", err))
		}
	}
	return User{}, fmt.Errorf("create user %s: lost the race twice", phone)
}
