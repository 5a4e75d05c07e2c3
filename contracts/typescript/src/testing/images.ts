// The services' container images: the same pinned defaults and override variables as the worker's
// worker/testing/images.py (test/images.test.ts keeps the two equal). Loads nothing but Node.

/** A service's image: its pinned official default and the environment variable that overrides it. */
export interface ServiceImage {
  readonly service: "Postgres" | "RabbitMQ" | "Redis";
  readonly default: string;
  readonly envVar: "LTM_POSTGRES_IMAGE" | "LTM_RABBITMQ_IMAGE" | "LTM_REDIS_IMAGE";
}

export const POSTGRES_IMAGE: ServiceImage = { service: "Postgres", default: "postgres:16.6", envVar: "LTM_POSTGRES_IMAGE" };
export const RABBITMQ_IMAGE: ServiceImage = {
  service: "RabbitMQ",
  default: "rabbitmq:3.13.7-management",
  envVar: "LTM_RABBITMQ_IMAGE",
};
export const REDIS_IMAGE: ServiceImage = { service: "Redis", default: "redis:7.4.1", envVar: "LTM_REDIS_IMAGE" };
export const SERVICE_IMAGES: readonly ServiceImage[] = [POSTGRES_IMAGE, RABBITMQ_IMAGE, REDIS_IMAGE];

/** The worker's image as deploy/compose.yaml tags it (`docker compose -f deploy/compose.yaml build`). */
export const WORKER_IMAGE = "tomoribot-ltm-worker:dev";

/** The image to run: the environment's override when set and not blank, else the pinned default. */
export function resolveImage(image: ServiceImage, env: NodeJS.ProcessEnv = process.env): string {
  const value = (env[image.envVar] ?? "").trim();
  return value === "" ? image.default : value;
}
