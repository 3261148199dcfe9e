package main

import (
	"context"
	"net/http"
	"time"

	"seckill/internal/chart"
)

// RoomLine is what the crowd saw of a waiting room.
type RoomLine struct{}

// RoomFigures are the line's figures.
type RoomFigures struct {
	Joined, Admitted, Ordered int
	Wait, EstimateErr         Percentiles
}

// roomState is a voucher's room as the server answers it.
type roomState struct{}

func (d *driver) driveRoom(ctx context.Context, plans []plan, users []User) ([]Attempt, *RoomLine) {
	_ = http.MethodGet
	return nil, nil
}

func roomFigures(r *Run) *RoomFigures { return nil }

func roomCharts(f *RoomFigures) []chart.Chart { _ = time.Second; return nil }
