package auth

import (
	"context"
	"crypto/rand"
	_ "embed"
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

const (
	codeTTL      = 5 * time.Minute
	maxCodeTries = 5
)

var (
	phoneRE = regexp.MustCompile(`^1[0-9]{10}$`)
	codeRE  = regexp.MustCompile(`^[0-9]{6}$`)

	errBadPhone = apperr.Invalid("phone must be 11 digits starting with 1")
	errBadCode  = apperr.Invalid("code must be 6 digits")

	//go:embed check_code.lua
	checkCodeSrc    string
	checkCodeScript = redis.NewScript(checkCodeSrc)
)

// Sender delivers a login code to a phone. The project ships no SMS
// gateway; cmd/server plugs in one that logs.
type Sender func(ctx context.Context, phone, code string)

// Service logs users in.
type Service struct {
	db     *gorm.DB
	rdb    redis.UniversalClient
	tokens *Tokens
	admins map[string]bool
	send   Sender
}

// NewService returns a Service; admins are the phones that log in as admin.
func NewService(db *gorm.DB, rdb redis.UniversalClient, tokens *Tokens, admins []string, send Sender) *Service {
	set := make(map[string]bool, len(admins))
	for _, p := range admins {
		set[p] = true
	}
	return &Service{db: db, rdb: rdb, tokens: tokens, admins: set, send: send}
}

func codeKey(phone string) string { return "login:code:" + phone }

// SendCode makes a new code for phone, replacing any earlier one, and
// returns it (the handler shows it only in dev mode).
func (s *Service) SendCode(ctx context.Context, phone string) (string, error) {
	if !phoneRE.MatchString(phone) {
		return "", errBadPhone
	}
	n, err := rand.Int(rand.Reader, big.NewInt(1_000_000))
	if err != nil {
		return "", fmt.Errorf("make login code: %w", err)
	}
	code := fmt.Sprintf("%06d", n.Int64())
	pipe := s.rdb.TxPipeline()
	pipe.Del(ctx, codeKey(phone))
	pipe.HSet(ctx, codeKey(phone), "code", code, "tries", 0)
	pipe.Expire(ctx, codeKey(phone), codeTTL)
	if _, err := pipe.Exec(ctx); err != nil {
		return "", apperr.Down(fmt.Errorf("store login code: %w", err))
	}
	s.send(ctx, phone, code)
	return code, nil
}

// Login checks phone's code, creates the user on first login, and returns
// a token with the user.
func (s *Service) Login(ctx context.Context, phone, code string) (string, User, error) {
	if !phoneRE.MatchString(phone) {
		return "", User{}, errBadPhone
	}
	if !codeRE.MatchString(code) {
		return "", User{}, errBadCode
	}
	ok, err := checkCodeScript.Run(ctx, s.rdb, []string{codeKey(phone)}, code, maxCodeTries).Int()
	if err != nil {
		return "", User{}, apperr.Down(fmt.Errorf("check login code: %w", err))
	}
	if ok != 1 {
		return "", User{}, ErrWrongCode
	}
	u, err := s.user(ctx, phone)
	if err != nil {
		return "", User{}, err
	}
	role := RoleUser
	if s.admins[phone] {
		role = RoleAdmin
	}
	token, err := s.tokens.Issue(Identity{UserID: u.ID, Role: role})
	return token, u, err
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
