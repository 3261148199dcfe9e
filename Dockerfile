# syntax=docker/dockerfile:1
#
# Two stages: the Go toolchain builds a static binary (CGO_ENABLED=0: the
# embedded demo's SQLite is pure Go, so nothing needs libc), then a
# distroless image with no shell and no package manager runs it as a
# non-root user. The migrations are embedded in the binary.
#
#   docker build -t seckill .
#   docker compose up --build

FROM golang:1.26 AS build
WORKDIR /src
# Dependencies first, in their own layer: it is rebuilt only when go.mod
# or go.sum change, not on every edit of the code.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/seckill ./cmd/server

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/seckill /usr/local/bin/seckill
# nonroot is uid 65532 in distroless images.
USER nonroot:nonroot
ENV HTTP_ADDR=:8080
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/seckill"]
