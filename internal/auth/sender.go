package auth

import (
	"context"
	"log/slog"
)

// Sender delivers a login code to a phone. It is the one place a code
// leaves the server on purpose; an SMS gateway's client belongs here.
type Sender interface {
	Send(ctx context.Context, phone, code string) error
}

// LogSender stands in for an SMS gateway, which the project does not
// ship: it logs that a code was sent, to which phone (masked), and never
// the code itself. Logs are read by many people and kept for long; a code
// in them is a login for anyone who reads them within five minutes. A
// real gateway plugs in where cmd/server builds this one.
type LogSender struct {
	log *slog.Logger
}

// NewLogSender returns a LogSender writing to log.
func NewLogSender(log *slog.Logger) *LogSender { return &LogSender{log: log} }

// Send logs that a code went to phone, without the code.
func (s *LogSender) Send(ctx context.Context, phone, _ string) error {
	s.log.InfoContext(ctx, "login code sent (no SMS gateway is configured: nobody receives it)", "phone", maskPhone(phone))
	return nil
}

// DevSender writes each code to the log, so that someone trying the
// server can log in without a phone. Only for the embedded demo and
// AUTH_DEV_CODES=true, where the code is in the answer anyway.
type DevSender struct {
	log *slog.Logger
}

// NewDevSender returns a DevSender writing to log.
func NewDevSender(log *slog.Logger) *DevSender { return &DevSender{log: log} }

// Send logs phone's code.
func (s *DevSender) Send(ctx context.Context, phone, code string) error {
	s.log.InfoContext(ctx, "login code (development: codes are logged and answered)", "phone", phone, "code", code)
	return nil
}

// maskPhone keeps the first three and the last four digits: enough to
// tell two phones apart in a log, not enough to call one. A phone number
// is personal data, and a log is no place to collect it.
func maskPhone(phone string) string {
	if len(phone) != 11 {
		return "***"
	}
	return phone[:3] + "****" + phone[7:]
}
